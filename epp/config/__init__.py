"""The EndpointPickerConfig file: its model, its decoding and validation, and the one duration grammar.

Below every package that reads a config value (scheduling, scrape, federation), so a feeder that needs a section
(the scraper's metric names, the site watch's address rule) never imports decision code to get it. Import the
modules, not this package: `model` (the typed sections), `decode` (a parsed document → model, pure),
`federation` (the `federation:` section's schema), `durations` (Go durations), `files` (the only one that reads a
file or YAML; the decision layer may not import it, import-linter checks that).
"""
