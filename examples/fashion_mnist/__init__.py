"""Fashion-MNIST: a small CNN over ten label-skewed (Dirichlet) clients."""
