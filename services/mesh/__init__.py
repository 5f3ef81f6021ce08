"""`oms up`: the whole mesh on one machine, as supervised child processes."""
