"""Monitoring: metric storage, health verdicts, remediation, alerts and their notifications."""
