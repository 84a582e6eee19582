"""epp.scrape"""
