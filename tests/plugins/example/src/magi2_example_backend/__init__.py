"""A third-party backend as a vendor would write it: one plugin module, one kernel module."""
