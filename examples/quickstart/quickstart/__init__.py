"""quickstart: Flower's PyTorch quickstart on 5,000 embedded MNIST digits, made private with
CorBin-FL (arXiv 2409.13133) by a strategy wrapper and a ClientApp mod."""
