"""Getting corpora onto disk: checked downloads (`fetch`), the recipes' public corpora
(`public_corpora`), offline-first TFDS loading (`tfds_reader`) and sweeping what killed
builds left behind (`leftovers`)."""
