"""What a run reads, checked before any GPU is taken: paths under the allowed roots, the model source, the tokenizer;
and a checkpoint as a tar stream."""
