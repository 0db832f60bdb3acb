def copy(x, n):
    return x
