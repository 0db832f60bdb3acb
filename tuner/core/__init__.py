"""What every stage shares, below them all: the typed results and failures an evaluation returns (`result`), the
error that means "the user's input is wrong" (`errors`), what a GPU offers a kernel (`gpufacts`), what ships with the
package (`shipped`), and the one door to CUDA's bindings (`cudalib`). It takes nothing from the stages and gives
them these types and facts; no module here imports a stage."""
