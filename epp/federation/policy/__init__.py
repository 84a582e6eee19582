"""epp.federation.policy (see issue: Federation)"""
