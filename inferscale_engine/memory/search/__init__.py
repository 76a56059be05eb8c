"""The search room: from a text to the user's facts most like it.

  embedder.py    Embedder: texts to L2-normalized float32 vectors (sentence-transformers)
  index.py       RetrievalIndex: a UserIndex per user on a torch device, cosine top-k (and
                 each user's keyword index with it)
  user_index.py  UserIndex: one user's embedding matrix, scored by one matmul
  vectors.py     the index's inputs: fact ids and embeddings checked, moved, read back
  lexical.py     LexicalIndex: per user, BM25 keyword search over fact texts (SQLite FTS5)
  hybrid.py      search modes: 'vector', or 'hybrid' (cosine fused with BM25)
  filters.py     metadata filters of search and listing (mem0's and LangGraph's shape)
  retrieval.py   the read rules on top: a search narrowed by filter and scope, the facts one
                 request is served with (top-k, then recent), duplicates of new facts
  versions.py    older versions of a found fact, left out of reads about the present
  recency.py     recency_weight (off by default): newer relevant facts raised in the choice
  neighbors.py   neighbor_share: part of k given to the facts added beside the best ones

Names are imported from their modules (embedder and index import torch; filters does not).
"""
