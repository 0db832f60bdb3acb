def scale_add(x, y, alpha, n): return alpha * x + y
