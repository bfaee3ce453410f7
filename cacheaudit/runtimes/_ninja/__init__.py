"""What the runtimes that build through ninja share (torch.utils.cpp_extension and FlashInfer's
JIT both write a build.ninja and run ninja in the entry's directory): build.ninja parsed, the deps
log read, ninja's own decision asked (`build`). Not a runtime itself: the registry lists the
runtimes, whose packages import from here, as the DeepSeek family does from `_deepseek`."""
