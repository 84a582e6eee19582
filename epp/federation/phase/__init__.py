"""epp.federation.phase (see issue: Federation)"""
