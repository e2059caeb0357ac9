"""Operations: what operators do to a running service without an outage.

A rollout or restart (:mod:`.rollout`, with its strategy: :mod:`.strategies`), a
move of one replica to another node (:mod:`.moves`, run step by step by
:mod:`.move_steps`), the refusals they share (:mod:`.refusals`) and a replica's
engine log (:mod:`.logs`). Each records its intent in the store; the reconciler
carries it out.
"""
