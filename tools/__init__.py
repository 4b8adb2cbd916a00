"""Standalone scripts (standard library only) that the package also imports: the auditor's proof checker."""
