# The fixture trees hold sysfs-style symlink cycles (node/device -> parent) that pytest would
# follow forever while collecting.
collect_ignore_glob = ["*"]
