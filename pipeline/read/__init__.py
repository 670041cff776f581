"""Reading: the sources a build names found, opened and read row by row."""
