"""torch.compile's Inductor: its FX graph, AOTAutograd and C++ kernel caches (issue 15)."""
