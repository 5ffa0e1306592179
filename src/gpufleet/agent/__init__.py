"""The node agent: joins the head, then keeps a channel open with heartbeats and reports its inventory.

It always connects out (the head never connects to nodes) and installs without the server's dependencies.
"""
