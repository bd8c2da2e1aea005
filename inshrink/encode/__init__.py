"""What the encoder chooses and never stores: quantization configs and policies (:mod:`.policy`),
tensor roles (:mod:`.roles`), the quantizer (the sketch pass :mod:`.sketch`, the fit and its
bin ladder :mod:`.fit`, the code assignment :mod:`.quantizer`, with the per-thread arrays of
:mod:`.scratch`) and the one per-tensor decision (:mod:`.tensor`)."""
