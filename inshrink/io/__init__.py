"""Files: the Writer pipeline and the File reader (:mod:`.tensorfile`), delta rewrites (:mod:`.rebase`), and one array in memory as an array frame (:mod:`.frame`)."""
