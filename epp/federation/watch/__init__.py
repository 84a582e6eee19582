"""epp.federation.watch (see issue: Federation)"""
