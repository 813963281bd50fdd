"""Pure NumPy/SciPy theory of signal propagation (float64, vectorised). Never imports torch."""
