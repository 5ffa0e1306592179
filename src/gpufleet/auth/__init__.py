"""Who may do what: API tokens (admin, join, node credentials). Users and roles arrive with issue 3."""
