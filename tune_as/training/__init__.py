"""The training loop (`loop`), run by a solo trial (`trial`: one model) or a population (`population`: P seeds
of one model, stacked by `stacked` and `stacked_cnn`), and their stateless tools (`tools`); no Ray here."""
