"""epp.scheduling"""
