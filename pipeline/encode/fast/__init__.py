"""The fast exact encoders, and the checks that admit them against the HF tokenizer."""
