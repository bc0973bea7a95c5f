// Built as a shared object linking the static mha libraries: the link fails if any of their
// code (the kernels included) is not position-independent.
#include "mha/mha.h"

extern "C" size_t mha_linked_kernel_count() { return mha::linked_kernels().size(); }
