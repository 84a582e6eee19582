"""epp.gateway"""
