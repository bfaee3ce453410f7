"""DeepEP's EPv2 JIT: DeepGEMM's C++ JIT under the EP_ prefix (its layout and policy are
DeepGEMM's)."""
