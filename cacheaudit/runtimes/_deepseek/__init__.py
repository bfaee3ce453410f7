"""What DeepJIT, DeepGEMM and DeepEP share: the `<PREFIX>_JIT_*` settings, their entry and build
directory names, and their digest arithmetic. Not a runtime itself: the registry lists the three
runtimes, whose packages import from here."""
