-- Nodes from anywhere (docs/tunnel.md): each node's address in its cluster, chosen by the
-- broker when it plans the node (the identity's node_ip, the kubelet's --node-ip), reached
-- over the mesh; NULL for provisions planned before this.
ALTER TABLE provisions ADD COLUMN node_ip TEXT;
