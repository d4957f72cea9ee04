"""TritonSemantic, as the interpreter drives it, deciding on plain int shapes and per-type keys.

Part of speed.py's edits (speed.install() installs these, only on a triton inside
fence.TESTED), under the same rules: triton's own function kept as `__wrapped__` and given
anything not recognised, nothing changed when triton's internals are not where expected.
TritonSemantic re-derives, on every operation, decisions that depend only on the operands'
types and shapes; here they are taken on plain values and kept. Types are keyed by `_type_key`
(scalar dtypes and pointers); anything else goes to triton.
"""
from __future__ import annotations

from fuzzattn.triton_interpreter.fence import MARK as _MARK

_scalar_type = _pointer_type = None     # triton.language.core's dtype and pointer_type, once installed
_block_types: dict = {}     # (element type key, dims) -> (block_type, its IR type under the interpreter)


def install(interp) -> None:
    """Idempotent; called by speed.install() with triton's interpreter module."""
    global _scalar_type, _pointer_type
    from triton.language import core
    _scalar_type, _pointer_type = getattr(core, "dtype", None), getattr(core, "pointer_type", None)
    if _scalar_type is None or _pointer_type is None:
        return
    _broadcast_by_shape(interp)
    _binary_type_decisions_once(interp)
    _expand_dims_by_shape(interp)
    _tensors_kept_first(interp)


def _type_key(ty):
    """A hashable stand-in for a scalar or pointer dtype, equal for two types exactly when
    triton's own __eq__ says they are (dtypes compare by name, pointer types by pointee, address
    space and constness); None for any other type, which the callers then leave to triton.
    (pointer_type and block_type define __eq__ without __hash__: they cannot be keys themselves.)"""
    cls = type(ty)
    if cls is _scalar_type:
        return ty.name
    if cls is _pointer_type:
        inner = _type_key(ty.element_ty)
        return None if inner is None else ("ptr", inner, ty.address_space, ty.const)
    return None


def _block_type_for(element_ty, dims: tuple, builder):
    """(block_type(element_ty, dims), its to_ir(builder)), built once per (element type, dims)
    and shared after. Triton itself shares type objects between values (an op's result takes
    its operand's `type`); nothing mutates one. The IR type is triton's own to_ir result: under
    the interpreter a pure function of the type (an equal block_type)."""
    key = (_type_key(element_ty), dims)
    found = _block_types.get(key)
    if found is None:
        from triton.language import core
        ty = core.block_type(element_ty, list(dims))
        found = _block_types[key] = (ty, ty.to_ir(builder))
    return found


def _broadcast_by_shape(interp) -> None:
    """TritonSemantic.broadcast_impl_value compares block shapes as tl.tuples (each `!=` unwraps
    both into new tuples) and builds a new block_type and its IR type for each splat and
    broadcast. Here the same decisions are taken on the shapes' plain int lists, with block types
    shared per (element type, shape); the builder calls are triton's own. Scalar/scalar, equal
    shapes, scalar/block and same-rank broadcasts take this path; different ranks, mismatches
    (errors), builders other than the interpreter's and types without a key go to triton's own."""
    semantic_cls = getattr(interp, "TritonSemantic", None)
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    original = getattr(semantic_cls, "broadcast_impl_value", None)
    from triton.language import core
    block_type = getattr(core, "block_type", None)
    if None in (original, builder_cls, block_type) or getattr(original, _MARK, False):
        return

    def splat(semantic, value, dims):
        ty, ir_ty = _block_type_for(value.type, dims, semantic.builder)
        return semantic.tensor(semantic.builder.create_splat(ir_ty, value.handle), ty)

    def broadcast(semantic, value, out):
        ty, _ = _block_type_for(value.type.element_ty, tuple(out), semantic.builder)
        return semantic.tensor(semantic.builder.create_broadcast(value.handle, out), ty)

    def broadcast_impl_value(self, lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        lhs_block, rhs_block = type(lhs_ty) is block_type, type(rhs_ty) is block_type
        if type(self.builder) is not builder_cls or (
                not lhs_block and _type_key(lhs_ty) is None) or (not rhs_block and _type_key(rhs_ty) is None):
            return original(self, lhs, rhs)
        if lhs_block and rhs_block:
            lhs_dims, rhs_dims = lhs_ty.shape.values, rhs_ty.shape.values
            if lhs_dims == rhs_dims:
                return lhs, rhs
            if len(lhs_dims) != len(rhs_dims) or _type_key(lhs_ty.element_ty) is None \
                    or _type_key(rhs_ty.element_ty) is None:
                return original(self, lhs, rhs)
            out = []
            for left, right in zip(lhs_dims, rhs_dims):
                if left == 1:
                    out.append(right)
                elif right == 1 or right == left:
                    out.append(left)
                else:
                    return original(self, lhs, rhs)          # triton raises its own error
            if lhs_dims != out:
                lhs = broadcast(self, lhs, out)
            if rhs_dims != out:
                rhs = broadcast(self, rhs, out)
            return lhs, rhs
        if lhs_block:
            return lhs, splat(self, rhs, tuple(lhs_ty.shape.values))
        if rhs_block:
            return splat(self, lhs, tuple(rhs_ty.shape.values)), rhs
        return lhs, rhs

    setattr(broadcast_impl_value, _MARK, True)
    broadcast_impl_value.__wrapped__ = original      # triton's own, for tests and debugging
    semantic_cls.broadcast_impl_value = broadcast_impl_value


def _binary_type_decisions_once(interp) -> None:
    """TritonSemantic.binary_op_type_checking_impl (every binary op) re-derives, per call, the
    pointer checks, the computation type and which operand needs a cast, all functions of the two
    scalar types (by name), which operand is a Python number and the call's flags; here they are
    derived by triton's own functions once per such key and kept. Per call, as triton does:
    Python numbers become tensors, value-dependent checks (a negative or out-of-range number for
    an integer type; on failure triton's own function runs and raises its own error), the casts
    that change a type, and the broadcast. A cast to the type a value already has is skipped:
    triton's cast returns its input unchanged then. Types without a key (not a plain dtype or
    pointer) go to triton's own."""
    import numbers
    semantic_cls = getattr(interp, "TritonSemantic", None)
    original = getattr(semantic_cls, "binary_op_type_checking_impl", None)
    if original is None or getattr(original, _MARK, False) or not all(
            hasattr(semantic_cls, name) for name in
            ("check_ptr_type_impl", "computation_type_impl", "cast", "scalar_constant", "to_tensor")):
        return
    decisions: dict = {}   # key -> None (no arithmetic conversion) or (result picker, cast lhs, cast rhs)

    def decide(self, lhs_ty, lhs_is_scalar, rhs_ty, rhs_is_scalar, allow_lhs_ptr, allow_rhs_ptr,
               arithmetic_check, div_or_mod):
        """triton's checks (they raise on a bad pair, and then nothing is kept) and result type,
        as (0: lhs's type, 1: rhs's type, 2: the third item), whether lhs, rhs need a cast."""
        self.check_ptr_type_impl(lhs_ty, rhs_ty, allow_lhs_ptr)
        self.check_ptr_type_impl(rhs_ty, lhs_ty, allow_rhs_ptr)
        if not arithmetic_check or lhs_ty.is_ptr() or rhs_ty.is_ptr():
            return None
        ret = self.computation_type_impl(lhs_ty, lhs_is_scalar, rhs_ty, rhs_is_scalar, div_or_mod)
        pick = 0 if ret is lhs_ty else 1 if ret is rhs_ty else 2
        return pick, ret, _type_key(lhs_ty) != _type_key(ret), _type_key(rhs_ty) != _type_key(ret)

    def in_range(value, ty):
        """value (a Python number) passes triton's checks against the result type ty."""
        if not ty.is_int():
            return True
        if value < 0 and ty.is_int_unsigned():
            return False
        return ty.get_int_min_value() <= value <= ty.get_int_max_value()

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False,
                                     arithmetic_check=True, div_or_mod=False):
        lhs_is_scalar = isinstance(lhs, numbers.Number)
        rhs_is_scalar = isinstance(rhs, numbers.Number)
        lhs_t = self.to_tensor(lhs) if lhs_is_scalar else lhs
        rhs_t = self.to_tensor(rhs) if rhs_is_scalar else rhs
        lhs_ty, rhs_ty = lhs_t.type.scalar, rhs_t.type.scalar
        lhs_key, rhs_key = _type_key(lhs_ty), _type_key(rhs_ty)
        if lhs_key is None or rhs_key is None:
            return original(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        key = (lhs_key, lhs_is_scalar, rhs_key, rhs_is_scalar, allow_lhs_ptr, allow_rhs_ptr,
               arithmetic_check, div_or_mod)
        if key in decisions:
            decided = decisions[key]
        else:
            decided = decisions[key] = decide(self, lhs_ty, lhs_is_scalar, rhs_ty, rhs_is_scalar,
                                              allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        if decided is not None:
            pick, fixed, cast_lhs, cast_rhs = decided
            ret = (lhs_ty, rhs_ty, fixed)[pick]
            if (lhs_is_scalar and not in_range(lhs, ret)) or (rhs_is_scalar and not in_range(rhs, ret)):
                return original(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
            if lhs_is_scalar:
                lhs_t = self.scalar_constant(lhs, dtype=ret)
            elif cast_lhs:
                lhs_t = self.cast(lhs_t, ret)
            if rhs_is_scalar:
                rhs_t = self.scalar_constant(rhs, dtype=ret)
            elif cast_rhs:
                rhs_t = self.cast(rhs_t, ret)
        return self.broadcast_impl_value(lhs_t, rhs_t)

    setattr(binary_op_type_checking_impl, _MARK, True)
    binary_op_type_checking_impl.__wrapped__ = original      # triton's own, for tests and debugging
    semantic_cls.binary_op_type_checking_impl = binary_op_type_checking_impl


def _expand_dims_by_shape(interp) -> None:
    """TritonSemantic.expand_dims (every `x[:, None]`) unwraps the tensor's constexpr shape and
    builds a new block_type; here the new shape is the block type's own int list with the 1
    inserted as triton inserts it, its block type shared (_block_type_for), the builder call
    triton's own. Scalars (splat), other builders and types without a key go to triton's own."""
    from triton.language import core
    semantic_cls = getattr(interp, "TritonSemantic", None)
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    original = getattr(semantic_cls, "expand_dims", None)
    block_type = getattr(core, "block_type", None)
    if None in (original, builder_cls, block_type) or getattr(original, _MARK, False):
        return

    def expand_dims(self, input, axis):
        ty = input.type
        if type(ty) is not block_type or type(self.builder) is not builder_cls \
                or _type_key(ty.element_ty) is None:
            return original(self, input, axis)
        dims = list(ty.shape.values)
        dims.insert(axis, 1)
        new_ty, _ = _block_type_for(ty.element_ty, tuple(dims), self.builder)
        return self.tensor(self.builder.create_expand_dims(input.handle, axis), new_ty)

    setattr(expand_dims, _MARK, True)
    expand_dims.__wrapped__ = original      # triton's own, for tests and debugging
    semantic_cls.expand_dims = expand_dims


def _tensors_kept_first(interp) -> None:
    """The interpreter rewrites every assignment in a kernel `x = value` into
    `x = interpreter_semantic.to_tensor(value, False)`, and TritonSemantic.to_tensor tests bool,
    int, float and constexpr before it returns a tensor as it is. A value whose class is exactly
    the semantic's tensor class is returned at once, as triton's tests end for it; anything else
    goes to triton's own."""
    semantic_cls = getattr(interp, "TritonSemantic", None)
    original = getattr(semantic_cls, "to_tensor", None)
    if original is None or getattr(original, _MARK, False) or not hasattr(semantic_cls, "tensor"):
        return

    def to_tensor(self, x, check_type=True):
        if type(x) is self.tensor:
            return x
        return original(self, x, check_type)

    setattr(to_tensor, _MARK, True)
    to_tensor.__wrapped__ = original      # triton's own, for tests and debugging
    semantic_cls.to_tensor = to_tensor
