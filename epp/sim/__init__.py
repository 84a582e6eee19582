"""epp.sim"""
