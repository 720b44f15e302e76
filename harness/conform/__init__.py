"""Conformance: outside implementations (frameworks' own loss code, user callables) against the reference, case by case and at the step level; the ecosystem matrix."""
