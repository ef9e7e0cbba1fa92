-- An agent's poll reads the parts its node holds now: index them by node.
create index allocations_node_active on allocations (node_id) where released_at is null;
