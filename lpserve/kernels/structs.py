"""numba StructRef types for the kernels' structures (passed between kernels as one
pointer): :func:`struct_type` registers a type class and its Python proxy."""
from __future__ import annotations

from numba import types
from numba.experimental import structref

__all__ = ["struct_type"]


def struct_type(name: str, module: str) -> tuple[type, type]:
    """``(NameType, Name)``: a registered StructRef type class (literal field types taken
    as their plain types) and its boxed Python proxy, both named as module ``module``
    (the caller's ``__name__``) binds them, so that numba's cache finds them there."""

    class _Type(types.StructRef):
        def preprocess_fields(self, fields):
            """The fields' types without literal values."""
            return tuple((n, types.unliteral(t)) for n, t in fields)

    class _Proxy(structref.StructRefProxy):
        pass

    for cls, cls_name in ((_Type, f"{name}Type"), (_Proxy, name)):
        cls.__name__ = cls.__qualname__ = cls_name
        cls.__module__ = module
    structref.register(_Type)
    structref.define_boxing(_Type, _Proxy)
    return _Type, _Proxy
