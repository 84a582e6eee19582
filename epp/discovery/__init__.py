"""epp.discovery"""
