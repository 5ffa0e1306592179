"""Foundations shared by every other package: settings, database, errors, clock, hostlists, loops."""
