"""Files: the Writer pipeline (:mod:`.writer`) and the File reader (:mod:`.file`), delta rewrites (:mod:`.rebase`), and one array in memory as an array frame (:mod:`.frame`)."""
