"""The project's benchmarks: scripts run by hand, not part of the installed package.

A regular package (not a namespace one) so that the ``benchmarks`` directory torchrl
installs into site-packages is neither merged with it nor found in its place.
"""
