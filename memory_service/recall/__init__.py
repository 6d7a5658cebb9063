"""The read path: recall's two legs, fused by rank, over the stores the write path filled.

- `search`: `recall` and `RecallQuery`: the keyword and vector legs, the journal rows they show, fusion;
- `rank`: reciprocal-rank fusion, keyword weighting and spreading the top k over saved texts;
- `floor`: the relevance floor, so an unrelated question is not answered with k items of noise;
- `words`: the query's word stems, which of them a text holds, how rare each is;
- `query_embeddings`: the cache of query vectors Services owns;
- `vectors/`: the vector leg, filtered vector search planned by how many vectors a filter keeps (exact,
  clustered, over-fetch or Chroma's `where`) and the hubness discount; imported through its face.
"""
