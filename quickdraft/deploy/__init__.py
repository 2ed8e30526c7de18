"""quickdraft replicas on Ray Serve behind one OpenAI-compatible endpoint (``quickdraft serve --replicas N``).

``ray_serve.py`` builds the application: an ingress that takes HTTP and a deployment of engine replicas, each a
whole quickdraft server (``server/``) on its own cores. ``router.py`` sends a conversation's requests to the
replica that holds its prefix; ``asgi.py`` runs a request through a replica's app in process. Ray is the optional
``ray`` extra: nothing here imports it until a deployment is made.
"""
