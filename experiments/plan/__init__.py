"""What the runners run: the study's run names, its stages and their cost, the tiny variants."""
