"""epp.observability"""
