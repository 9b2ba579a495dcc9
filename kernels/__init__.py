"""MXFP8 (OCP Microscaling v1.0) quantisation and the matmuls built on it.

``mx`` is the torch reference (the definition of every byte), ``triton_mx``
the bit-identical Triton kernel, ``linear`` the MXFP8 linear layer,
``grouped`` the mixture-of-experts grouped matmul, ``metrics`` the SQNR
helper. Nothing is imported here, so ``import kernels`` stays cheap.
"""
