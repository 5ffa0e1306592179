"""Dashboard templates and static assets (served by the api package)."""
