"""Slow actions as tasks in the database: bulk power, image sync, package installs, Ansible runs."""
