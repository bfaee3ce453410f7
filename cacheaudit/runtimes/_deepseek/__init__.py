"""What DeepJIT, DeepGEMM and DeepEP share: the `<PREFIX>_JIT_*` settings, their entry and build
directory names, their digest arithmetic, and the audit's checks of their settings (`checks`:
the `DJ_` fallback, CA203; settings read at construction, CA204). Not a runtime itself: the
registry lists the three runtimes, whose packages import from here."""
