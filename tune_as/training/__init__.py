"""The training loop of one trial (`trial`) and its stateless tools (`tools`); no Ray here."""
