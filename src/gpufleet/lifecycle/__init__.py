"""The fleet's lifecycle: burn-in acceptance before a node takes work, and rolling maintenance campaigns."""
