"""epp.federation"""
