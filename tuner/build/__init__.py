"""The build stage: (kernel, config, problem) → `Source` → `Compiled`, or a typed failure.

In: a family (its template, include folders, compile options), a config with its derived values, a problem.
`render` gives a `Source` (strict Jinja2: an undefined name is a `TemplateError` naming template and line);
`compile` gives a `Compiled` (cubin, PTX, registers, shared memory, spills per entry point) or a `CompileFailed`
with NVRTC's log. No GPU is needed. The compile cache is content-addressed (source, every included file, options,
arch, NVRTC version) and written atomically (`files`); `compilers` runs compiles in child processes (`child`:
fresh interpreters that never re-run the caller's ``__main__``); `cachedirs` makes the cache folders writable first.
"""
