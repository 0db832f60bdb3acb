"""The masked softmax's reference: a softmax over each row's kept positions, 0 where masked and for a row with
none kept, on whichever array module holds the arrays."""


def masked_softmax(x, mask, rows, xp):
    top = xp.where(mask, x, -xp.inf).max(axis=1, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0)
    e = xp.where(mask, xp.exp(x - top), 0)
    total = e.sum(axis=1, keepdims=True)
    return e / xp.where(total > 0, total, 1)
