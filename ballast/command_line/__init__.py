"""What the commands share: the options several commands take (one meaning each) and their
output files checked writable before the work."""
