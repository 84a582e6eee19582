"""epp.extproc"""
