"""Shared by the tests that run Triton kernels on the CPU (TRITON_INTERPRET=1)."""


def interpreter_numpy_shim():
    """triton 3.6's interpreter holds scalars as 1-element arrays and takes loop bounds with
    int(array), which numpy >= 2.4 refuses for arrays of one dimension: index the element."""
    from triton.runtime import interpreter
    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    interpreter._patch_lang_tensor = patched
